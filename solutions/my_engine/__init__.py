"""My engine: the functions I wrote in the kstore exercises, one file per chapter (written by kstore.my_engine.save)."""
