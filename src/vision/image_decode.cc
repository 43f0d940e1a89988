// placeholder: replaced by the image decoder
