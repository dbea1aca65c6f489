package shm

// SetUID makes t check peers against uid instead of its own, so tests
// can play a peer of another user without a second account.
func SetUID(t *Transport, uid uint32) { t.uid = uid }
