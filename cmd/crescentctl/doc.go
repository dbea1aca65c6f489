// Command crescentctl is the store's command-line client: put, get, rm,
// ls, stat, segments, clients, health and events against a master.
//
//	crescentctl --master 127.0.0.1:50051 put mykey ./value.bin
//	crescentctl get mykey > value.bin
//	crescentctl --admin 127.0.0.1:9003 -o json segments
//	crescentctl events --replay-from 0
//
// Run "crescentctl -h" for the commands, flags and exit codes; the logic
// is package ctl.
package main
