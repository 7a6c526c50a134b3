package topology_test

import (
	"testing"

	"github.com/acemq/outbox/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }
