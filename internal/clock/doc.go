// Package clock lets time be injected: production code takes a Clock, and
// tests drive a Fake one so leases, TTLs and timeouts can be tested
// without sleeping.
package clock
