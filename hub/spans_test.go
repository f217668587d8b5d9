package hub_test
