package main

// main is never run: c-shared builds need a package main.
func main() {}
