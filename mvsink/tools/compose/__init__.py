"""Running mvsink under `docker compose`: the engine and images (`engine`), and the end-to-end
verification of the compose deployment (`verify`)."""
