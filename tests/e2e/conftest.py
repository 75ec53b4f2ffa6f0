"""Fixtures of end-to-end tests only: real processes, and the data they are sent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.models import train_script
from tests.support.stack import Stack, new_stack, serving


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A private Redis, the API, a digits worker and the webhook sender, as real processes."""
    with serving(new_stack(tmp_path_factory.mktemp("stack"), INFERQ_TEST_SLOW_S="1.5")) as running:
        running.start_api()
        running.start_worker("digits")
        running.start("webhooks", name="webhooks")
        running.wait_for_worker("digits")
        yield running


@pytest.fixture(scope="session")
def digits_heldout() -> tuple[Any, Any]:
    """The held-out split the digits model never saw in training: (images, labels)."""
    module = train_script("digits")
    _, _, images, labels = module.load_split()
    return [module.render_png(image) for image in images], [str(int(label)) for label in labels]
