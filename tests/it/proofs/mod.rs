//! Proofs that limits hold: no over-admission across a fleet, the Lua script equal to the
//! in-memory bucket, clock modes, edge cases. (Filled in by the proofs work.)
