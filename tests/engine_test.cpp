// engine tests
