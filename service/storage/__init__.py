"""Redis as the system of record: the embedded server, the client, the Lua scripts, the codec."""
