module example.com/hello

go 1.26.0

require example.com/greeting v0.0.0

replace example.com/greeting => ../greeting
