//go:build race

package extproc

// concurrentStreams is how many streams TestManyStreams holds open at once: under the race
// detector, 2,000 open in a few seconds on a 2-core CI runner.
const concurrentStreams = 2000
