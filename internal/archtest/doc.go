// Package archtest holds the import rules of DESIGN.md ("Imports point one
// way") as a test: each rule names a package (or a subtree) and what of
// the project, or of the outside, it may not import, directly or through
// its dependencies. It reads the build graph with `go list`, so it sees
// what the compiler sees.
package archtest
