"""`graphmode batch`: many targets, each a `graphmode adapt` process, locally or on Ray."""
