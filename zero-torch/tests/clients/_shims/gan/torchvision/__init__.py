"""Stand-in for torchvision (not installed in the test environment) holding only
``torchvision.utils.save_image``, which ``gan_deepspeed_train.py`` calls to dump image grids
(``import torchvision.utils as vutils``). Its datasets are replaced by synthetic data in the
script itself. Only appended to ``sys.path`` by the client suite's bootstrap, for the GAN
only, so an installed torchvision wins."""
