"""The demo models' training scripts (models/*/train.py), as the README runs them."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.support.models import train_script


@pytest.mark.parametrize("model", ["digits", "langid"])
def test_a_demo_trains_on_one_thread_so_a_loaded_machine_cannot_stall_it(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenMP's threads spin while they wait for each other: beside busy processes a two-thread training of digits
    took over 600 s where one thread takes 35 (tests/e2e/test_e2e_up.py's README rollout failed so in a loaded run)."""
    script = train_script(model)
    seen: list[int] = []

    def stop_after_counting(*args: Any, **kwargs: Any) -> Any:
        seen.append(torch.get_num_threads())
        raise SystemExit(0)

    before = torch.get_num_threads()
    monkeypatch.setattr(script, "train", stop_after_counting)
    torch.set_num_threads(2)
    try:
        with pytest.raises(SystemExit):
            script.main(*([[]] if model == "digits" else []))
    finally:
        torch.set_num_threads(before)
    assert seen == [1]
