"""The composition root: what runs privet's ServerApp and ClientApp together.

The `privet` CLI (:mod:`privet.cli`), the in-process Grid that the fast tests and quick runs
use (:mod:`privet.inprocess`) and one-process simulations of a whole algorithm
(:mod:`privet.dpfedc_simulation`) import both sides; `server/` and `client/` import neither
each other nor this package.
"""
