//go:build !race

package extproc

// concurrentStreams is how many streams TestManyStreams holds open at once: 10,000 open in about
// 5 s on a 2-core machine without the race detector (34 KB of heap and stack per stream, both
// ends, measured).
const concurrentStreams = 10000
