"""The pure core: the master's state and the events that change it.

No threads, sockets, clocks or files in here. The shell (service, store, RPC) decides *when*
things happen and passes times in; the core decides *what* happens, one event at a time.
"""
