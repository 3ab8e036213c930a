"""The tpujob reference trainer (JAX + orbax); shares only `contract` with the operator."""
