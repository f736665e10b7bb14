from django.urls import path

from customers import views

urlpatterns = [
    path("customers", views.customers),
    path("customers/<str:customer_id>", views.customer),
]
