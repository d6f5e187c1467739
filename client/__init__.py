"""The ClientApp: the budget handshake, one client round for every mechanism, the ledger's file."""
