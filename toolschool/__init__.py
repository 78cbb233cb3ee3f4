"""toolschool: teach language models to use tools accurately."""

__version__ = "0.1.0"
