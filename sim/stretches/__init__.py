"""Fast paths of the engine loop ("stretches"): several steps advanced at once, exactly as the
per-step loop would advance them."""
