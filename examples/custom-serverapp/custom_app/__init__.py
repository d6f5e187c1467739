"""A third-party Flower app that reuses privet's strategy (see ../README.md)."""
