"""Command-line programs: argument parsing and printing, composed from the layers below."""
