// placeholder: written by the test author
