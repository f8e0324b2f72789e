package certs

import (
	"crypto/x509"
	"time"
)

// PublishDelay is how long a new CA is only trusted before the serving certificate moves to
// it: long enough for every namespace's ConfigMap to be updated and for Jobs started with the
// old bundle to finish.
const PublishDelay = 24 * time.Hour

// State is what the CA Secret and the workers' TLS Secret hold.
type State struct {
	CA *Pair
	// Previous is the CA before the last rotation, trusted until it expires; it still signs
	// the serving certificate until PublishDelay after the rotation.
	Previous *Pair
	// RotatedAt is when CA replaced Previous (zero when there is no Previous).
	RotatedAt time.Time
	Serving   *Pair
}

// Lifetimes of the two certificates.
type Lifetimes struct {
	CA, Serving time.Duration
}

// Renew returns the state to store at now: a CA when there is none or it is due, a serving
// certificate for names when there is none, it is due, its names changed, no trusted CA signed
// it, or it is still signed by the previous CA a PublishDelay after the rotation. next is when
// Renew has something to do again.
func Renew(st State, names []string, now time.Time, life Lifetimes) (_ State, next time.Time, _ error) {
	if st.CA == nil || !now.Before(st.CA.Cert.NotAfter) {
		ca, err := NewCA(now, life.CA)
		if err != nil {
			return st, now, err
		}
		st.CA, st.Previous, st.RotatedAt = &ca, nil, time.Time{}
	} else if Due(st.CA.Cert, now) {
		ca, err := NewCA(now, life.CA)
		if err != nil {
			return st, now, err
		}
		st.Previous, st.CA, st.RotatedAt = st.CA, &ca, now
	}
	if st.Previous != nil && !now.Before(st.Previous.Cert.NotAfter) {
		st.Previous, st.RotatedAt = nil, time.Time{}
	}
	moveAt := st.RotatedAt.Add(PublishDelay)
	// Until clients have had the time to learn the new CA, the previous one signs.
	signer := st.CA
	if st.Previous != nil && now.Before(moveAt) {
		signer = st.Previous
	}
	if servingStale(st, names, now, moveAt) {
		s, err := Issue(*signer, names, now, life.Serving)
		if err != nil {
			return st, now, err
		}
		st.Serving = &s
	}
	next = RenewAt(st.CA.Cert)
	if t := RenewAt(st.Serving.Cert); t.Before(next) {
		next = t
	}
	if signer != st.CA && moveAt.Before(next) {
		next = moveAt
	}
	return st, next, nil
}

func (p *Pair) cert() *x509.Certificate {
	if p == nil {
		return nil
	}
	return p.Cert
}

func servingStale(st State, names []string, now, moveAt time.Time) bool {
	s := st.Serving
	switch {
	case s == nil, Due(s.Cert, now), !sameNames(s.Cert, names):
		return true
	case SignedBy(s.Cert, st.CA.Cert):
		return false
	case SignedBy(s.Cert, st.Previous.cert()):
		return !now.Before(moveAt)
	default:
		return true
	}
}

// Roots is a pool of the bundle's certificates.
func Roots(bundle []byte) (*x509.CertPool, error) {
	cas, err := ParseCerts(bundle)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for _, c := range cas {
		pool.AddCert(c)
	}
	return pool, nil
}
