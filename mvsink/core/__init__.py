"""The shared core: what every other package agrees on, with no I/O.

Frontiers (`frontier`), the record contracts (`messages`) and their Avro codecs (`codec`),
update tables (`updates`) and row schemas (`rows`), the desired partitioning (`partitioning`),
the error kinds (`errors`) and the validated settings types (`settings`). Imports only
third-party libraries and itself.
"""
