package local

// Mix64 is the SplitMix64 finaliser (Steele, Lea and Flood, "Fast splittable pseudorandom number
// generators", OOPSLA 2014): a fixed, seedless bijection on 64 bits with full avalanche, so
// nearby or structured inputs (node ids, test-chosen hashes) get unrelated outputs. Routing's
// rendezvous weights, the summary checksum and the simulator's synthetic tokens all use it.
func Mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
