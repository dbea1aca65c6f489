package etcdmeta

// SetMaxReply sets the response bound of backends opened afterwards and
// returns a function that restores it.
func SetMaxReply(n int) (restore func()) {
	old := maxReply
	maxReply = n
	return func() { maxReply = old }
}
