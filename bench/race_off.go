//go:build !race

package main

// raceBuild is true when this program is built with -race (the bench's tests
// under the README's test command).
const raceBuild = false
