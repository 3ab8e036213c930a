//go:build tools

package tools

import _ "github.com/fsouza/fake-gcs-server"
