"""Export and import."""
