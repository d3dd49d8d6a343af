"""SFT trace synthesis (`predict traces`): `mutations` (the fault catalogue), `render` (one underlying trace -> each
arm's messages, by stepping the environment's `Episode`), `stage` (roles, mix, verification, parquet)."""
