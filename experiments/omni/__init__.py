"""The omni study (`relax study omni`): async against colocate on the omni task, through the engine."""
