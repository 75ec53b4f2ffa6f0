"""Code both the API and the workers use: settings, Redis keys, the job contract, model configs."""
