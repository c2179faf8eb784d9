"""Dash pages of the operations console, served inside Django by django-plotly-dash."""
