"""The application layer of `tf`: the Typer app (main.py), its commands (commands/), the
libraries they use by kind (training/, inference/, exporters/), and what every room shares
(config.py, device.py, files.py, figures.py).
"""
