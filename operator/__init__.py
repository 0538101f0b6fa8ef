"""Control plane: PrefixCacheFleet models, planners and kopf handlers (imported as prefixfleet.operator)."""
