"""The reusable job platform. Never imports ``accounts``."""
