"""Redis as the system of record: the embedded server, the client (:mod:`.client`), the Lua
scripts (``lua/``), one store class per aggregate (:mod:`.models`, :mod:`.logstore`,
:mod:`.gallery`, :mod:`.leases`, :mod:`.notices`, joined by :mod:`.store`), the codec, and the
errors (:mod:`.errors`): every failure of the Redis client leaves this package as the domain's
``StorageUnavailable``."""
