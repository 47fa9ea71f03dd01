"""The store's queries and writes, one module per aggregate.

Each function takes the transaction it runs in: a ``ProfileTx`` (from
``Store.reading(profile)`` / ``Store.writing(profile)``) for one profile's rows, or a
plain session for work across profiles (runs, leases). A caller reads what a step
needs in one block and writes its plan in another, so each write lands completely or
not at all.
"""
