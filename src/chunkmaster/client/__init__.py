"""The trainer's side: a connection to the master, and the record-streaming client."""
