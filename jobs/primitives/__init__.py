"""The primitives a kind is built from: retry and payload schema, the fence, checkpoints,
ask-again ladders, cooperative cancel, circuit breakers, ceilings, and bulk expansion
with its SQL."""
