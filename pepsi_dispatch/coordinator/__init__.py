"""pepsi-dispatch serve: the coordinator (the loop, its database side and its workers' side)."""
