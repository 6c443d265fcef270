"""What the tests share: the project's runs, checkpoints and environment, and checks any project can reuse."""
