package local

// sessionGateBlocks is the session gate (CONTRACT.md, "The session gate"), the single place its condition is written
// (both lookups call it; TestSessionGateSingleSource fails if another file spells it out, because
// two hand-written copies once drifted apart and only one of them ran).
//
// Outside hermetic mode plain and sibling entries are content-addressed and shared by every
// session, session 0 included. A tail is restorable only by its own nonzero session: it holds the
// SSM state at a block-floored boundary that may already include tokens beyond its token count,
// which is only right for the very conversation that captured it. Hermetic mode confines every
// entry to its own nonzero session.
func sessionGateBlocks(e *snapEntry, lookupSession uint64, hermetic bool) bool {
	if !hermetic && !e.isTail {
		return false
	}
	return lookupSession == 0 || e.session != lookupSession
}
