"""Flower apps (ServerApp, ClientApp), presets and the command line."""
