// Package e2e runs the real binaries, meshd and meshctl, as separate
// processes on loopback and checks what a user would see.
package e2e
