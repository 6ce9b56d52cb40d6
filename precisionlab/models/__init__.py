"""Small models shipped as package data for precision experiments."""
