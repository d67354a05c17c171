"""The recovery study (`relax study recovery`): real process kills, DCS weight sync, elastic rollout phases."""
