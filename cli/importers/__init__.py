"""Importers: the generic machinery that reads a pretrained model of another toolkit into a `tf`
run (where it is, its config.json, its weights, its generation settings, the run written);
each family's own reading is its record's (`cli.families`)."""
