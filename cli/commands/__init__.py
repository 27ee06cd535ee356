"""The verbs of `tf`: one file per command, each a plain function that `cli/main.py` calls.

A command reads its arguments, calls the libraries (training/, inference/, exporters/) and says
what it did; it never imports another command.
"""
