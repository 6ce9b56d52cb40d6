"""One module per subcommand. Each returns plain result objects and never prints."""
