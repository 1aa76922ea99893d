"""Helpers shared by the loaders: the Hub cache, chat templates."""
