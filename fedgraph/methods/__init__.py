"""The client and server computations of each method, as plain functions (no Flower here)."""
