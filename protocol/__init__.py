"""What crosses the wire between the ServerApp and the ClientApps, defined once.

Below both sides: `strategies/` (and `server/`) and `client/` import this package, never
each other. It holds every record, config, metric and node-config key (:mod:`protocol.keys`),
the run-config spelling helpers (:mod:`protocol.config`), the run-config sections both sides
read (:mod:`protocol.dpfedc`), PFA+'s coordinate format (:mod:`protocol.pfa_plus`) and the
logging both sides share (:mod:`protocol.log`).
"""
